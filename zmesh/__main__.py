from zmesh.cli import main

main()
