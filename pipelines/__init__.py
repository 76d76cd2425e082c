"""DVC stage entry points: thin ``main()`` functions around the library."""
