import sys

from speedkit.cli import main

sys.exit(main())
