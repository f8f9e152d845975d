"""Backends: how a machine is provisioned, watched and torn down (local emulation; Cloud TPU VMs)."""
