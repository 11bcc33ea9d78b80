"""What `muster simulate` prints and writes: the terminal table, the html page, the history."""
