import sys

from speedkit.cli.main import main

sys.exit(main())
