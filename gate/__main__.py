import sys

from gate.commands.main import main

sys.exit(main())
