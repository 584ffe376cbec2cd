"""`python -m optimizer ...`: see optimizer/cli/."""

import sys

from optimizer.cli import main

sys.exit(main())
