import sys

from gate.cli import main

sys.exit(main())
