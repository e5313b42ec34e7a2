"""Pure domain logic of Yak: no I/O, imports nothing from the rest of the package."""
