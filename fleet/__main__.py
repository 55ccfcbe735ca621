import sys

from fleet.cli.commands import main

sys.exit(main())
