"""Private addresses of the emulated instances: each its own on the loopback range.

A real instance has a private address its peers reach it on; a gang's nodes (``contract.gang``) listen
on theirs and connect to the head's. On Linux every address of 127.0.0.0/8 is the loopback interface,
so an emulated instance gets one of them (``127.<b>.<c>.<d>``) and its agent's job can bind it while
another instance's job connects to it, over real TCP. EC2's ``PrivateIpAddress`` and GCE's
``networkIP`` report it, and the metadata services serve it (``local-ipv4``,
``network-interfaces/0/ip``).

Addresses are unique among the live instances of one process (both clouds draw from the one
``ADDRESSES``); the second octet is drawn at random per process (1..254, never 127.0.x.x where the
servers listen), so two emulators on one host (test workers) rarely share a range either.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any


class LoopbackAddresses:
    """Hands out ``127.<octet>.<c>.<d>`` in turn, skipping those still held by a live instance."""

    def __init__(self, octet: int | None = None) -> None:
        self.octet = octet if octet is not None else random.SystemRandom().randint(1, 254)
        self._lock = threading.Lock()
        self._next = 0
        self._held: dict[str, Callable[[], bool]] = {}  # address -> "is its instance still live?"

    def take(self, held: Callable[[], bool]) -> str:
        """A free address, held from now on while ``held()`` says so (checked on later takes)."""
        with self._lock:
            for _ in range(254 * 254):
                c, d = divmod(self._next, 254)
                self._next = (self._next + 1) % (254 * 254)
                address = f"127.{self.octet}.{c + 1}.{d + 1}"
                owner = self._held.get(address)
                if owner is None or not _still(owner):
                    self._held[address] = held
                    return address
        raise RuntimeError(f"no free loopback address left in 127.{self.octet}.0.0/16")


def _still(held: Callable[[], bool]) -> bool:
    try:
        return bool(held())
    except Exception:  # whatever held it is gone
        return False


ADDRESSES = LoopbackAddresses()

_patched = False


def patch_moto() -> None:
    """Make moto give each new EC2 instance its own loopback address (in this process, idempotent).

    moto draws an instance's primary private address from its subnet (``Subnet.get_available_subnet_ip``)
    when the launch names one, else it makes one up before placing the interface in the default subnet
    (``Instance.prep_nics``); both now come from ``ADDRESSES``, held until the instance is terminated.
    An address the launch asks for, and interfaces made on their own, keep moto's behaviour.
    """
    global _patched
    if _patched:
        return
    from moto.ec2.models.instances import Instance
    from moto.ec2.models.subnets import Subnet

    def live(instance: Any) -> Callable[[], bool]:
        return lambda: instance.state != "terminated"

    def subnet_ip(subnet: Any, instance: Any) -> str:
        address = ADDRESSES.take(live(instance))
        subnet._subnet_ips[address] = instance
        return address

    original_prep = Instance.prep_nics

    def prep_nics(
        self: Any, nic_spec: list[dict[str, Any]], private_ip: str | None = None, **kw: Any
    ) -> None:
        primary = [n for n in nic_spec if int(n.get("DeviceIndex") or 0) == 0]
        if (
            private_ip is None
            and not self._subnet_id
            and not any(self._get_private_ip_from_nic(n) for n in primary)
        ):
            private_ip = ADDRESSES.take(live(self))
        original_prep(self, nic_spec, private_ip=private_ip, **kw)

    Subnet.get_available_subnet_ip = subnet_ip  # type: ignore[method-assign,assignment]
    Instance.prep_nics = prep_nics  # type: ignore[method-assign,assignment]
    _patched = True
