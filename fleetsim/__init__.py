"""The discrete-event fleet simulator (``gtm sim``, ``gtm bench routing``): see README.md.

It sits above the tiers: gtm's own decision code runs in its loop (:mod:`fleetsim.tiers`),
next to the published cross-region baselines (:mod:`fleetsim.baselines`), over analytic
GPUs whose model agrees with the emulated worker's (:mod:`gpusim`).
"""
