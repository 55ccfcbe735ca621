"""The command line, the top room: `commands` (the typer app and `main`, the console script), `options` (the
options several commands share and their help texts), `choose` (the hosts a command line targets) and `demo`
(`fleet demo`, the only product module that imports the simulator)."""
