"""`python -m clawrl.cli ...`: the `clawrl` command (how `clawrl serve` starts its trainer)."""

from clawrl.cli import main

raise SystemExit(main())
