from tasklock_cli.cli import main

main()
