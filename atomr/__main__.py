"""`python -m atomr ...`: the same as the `atomr` command (and as
`python -m atomr.cli ...`), for an environment whose scripts folder is not
on the PATH. Only `-m` imports this module: `import atomr` stays light."""

from atomr.cli.app import main

raise SystemExit(main())
