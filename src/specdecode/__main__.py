"""`python -m specdecode ARGS`: the command line, as the `specdecode` script runs it."""
import sys

from .cli import main

sys.exit(main())
