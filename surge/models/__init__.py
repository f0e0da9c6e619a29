"""Model networks and their files; knows nothing of requests, schedulers or HTTP.

`formats` reads files without torch (the API process imports only it); the networks
(`llama`, `bert`), their layers, quantized linears and compiled `kernels` are torch;
`build.build_model` assembles one. Importing this package imports nothing heavy.
"""
