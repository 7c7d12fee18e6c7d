"""`python -m clawrl ...`: the `clawrl` command, where the package is on the path but not installed."""

from clawrl.cli import main

raise SystemExit(main())
