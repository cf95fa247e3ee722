"""Probes: the only code in the doctor that touches the machine. Each returns plain frozen data,
so tests can replace a probe with one that returns recorded facts."""
