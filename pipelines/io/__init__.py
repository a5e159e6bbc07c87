"""Where the stages' files live, the same on a local disk and an object store; importing it imports none of them."""
