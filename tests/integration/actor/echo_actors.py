"""An actor that sends values straight back, or raises them: the transport round trip of user-facing types."""

import rlmesh as rm


class Echo(rm.Actor):
    @rm.endpoint
    async def echo(self, value):
        return value

    @rm.endpoint
    def echo_sync(self, value):
        return value

    @rm.endpoint
    def raise_it(self, exc: BaseException):
        raise exc
