"""``python -m hora.runner`` is ``horarun``."""

import sys

from hora.runner.cli import main

sys.exit(main())
