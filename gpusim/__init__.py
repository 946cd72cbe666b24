"""The emulated GPU worker (``gtm gpu-sim``): an OpenAI-compatible server in front of a
continuous-batching performance model of one GPU type.

A worker below the tiers: it imports only the core (:mod:`gtm`), :mod:`policies` and
third-party libraries, so ``gtm up`` and the integration tests can run it without any
router, and the routers see it exactly as they see a vLLM or SGLang worker (same
``/metrics`` names, same registration in the state store).

The performance model (:mod:`gpusim.engine`, :mod:`gpusim.perfmodel`,
:mod:`gpusim.prefix_cache`) is also the reference for the offline fleet simulator
(:mod:`fleetsim`), which imports it from here: one model of a GPU for the live
emulator and the simulator's pass-level GPUs.
"""
