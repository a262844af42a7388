"""httpx's one-request functions for the plain-HTTP servers the tests start on this machine, without the TLS
context that httpx builds for every client it makes: loading the CA bundle costs about 37 ms of CPU a
request, and the tests make hundreds (polling a server's health among them)."""

from functools import partial

import httpx

get = partial(httpx.get, verify=False)
post = partial(httpx.post, verify=False)
request = partial(httpx.request, verify=False)
