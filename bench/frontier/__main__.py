"""``python -m bench.frontier``: see bench/frontier/run.py."""

from bench.frontier.run import main

raise SystemExit(main())
