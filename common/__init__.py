"""Small pieces shared by operators/, progressive/ and eval/ (atomic file output, quiet imports)."""
