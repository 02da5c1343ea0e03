"""``python -m stoker.tools`` runs the CLI."""

import sys

from stoker.tools.cli import main

sys.exit(main())
