"""`python -m atomr.cli ...`: the same as the `atomr` command."""

from atomr.cli.app import main

raise SystemExit(main())
