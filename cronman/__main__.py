import sys

from cronman.cli import main

sys.exit(main())
