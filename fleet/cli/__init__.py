"""The command line, the top room: `console` (the console script: libraries' warnings quieted by
`library_warnings`, then the command line run), `commands` (the typer app and its `main`), `options` (the
options several commands share and their help texts), `choose` (the hosts a command line targets) and `demo`
(`fleet demo`, the only product module that imports the simulator)."""
