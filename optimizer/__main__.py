"""`python -m optimizer ...`: see optimizer/cli.py."""

import sys

from optimizer.cli import main

sys.exit(main())
