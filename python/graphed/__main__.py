"""`python -m graphed`: runs the doctor (graphed/_doctor.py); `python -m graphed bench` runs the
short benchmark of a checkout."""

import sys

from ._doctor import main

sys.exit(main())
