"""What writes the results page from the raw records: its tables and sections, and their intervals."""
