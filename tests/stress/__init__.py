"""Load and soak tests (marker `stress`)."""
