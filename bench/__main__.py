import sys

from bench.install import prepare

prepare(sys.argv[1:])  # before the harness reads which `tasklock` to time

from bench.cli import main  # noqa: E402

sys.exit(main())
