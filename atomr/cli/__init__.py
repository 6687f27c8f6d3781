"""The `atomr` command line: `atomr train`, `atomr devices`, `atomr bench`,
`atomr launch` and `atomr --version`.

`main(argv)` is the console entry point (`atomr = "atomr.cli:main"`); the
package also runs as `python -m atomr.cli`. One module per concept:
`parser` (arguments), `app` (dispatch and error handling), `run_config`
(validated training options), `strategies` (spawning each trainer),
`training_run` (the shared epoch loop), `history`, `progress`, `plotting`,
`bench`, `devices` and `launching`.
"""

from atomr.cli.app import main
from atomr.cli.errors import CliError

__all__ = ["CliError", "main"]
