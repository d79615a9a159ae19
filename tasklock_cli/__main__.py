from tasklock_cli.fastrun import main

main()
