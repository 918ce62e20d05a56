"""Example domains built on Tributary; the framework never imports them."""
