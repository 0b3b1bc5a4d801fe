"""The HTTP routes: thin shells over the ``ApiBackend`` port."""
