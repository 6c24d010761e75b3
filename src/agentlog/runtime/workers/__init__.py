"""Workers: take commands from the durable work queue and run them."""
