"""A user's program that imports nothing of the shim: says that it ran."""

print("user code ran")
