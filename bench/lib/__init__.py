"""The library room: what the bench rooms share. It imports no room."""
