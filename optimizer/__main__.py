"""`python -m optimizer ...`: see optimizer/cli.py."""

import sys

from .cli import main

sys.exit(main())
