import sys

from certify.run import main

sys.exit(main())
