from tasklock_cli.cli.entry import main

main()
