"""What the server, the gateway and the autoscaler share about HTTP: OpenAI's error shape, request
ids, deadlines, disconnects, a server that drains, the event loop, DNS discovery."""
