from frontend.app import main

main()
