"""The discrete-event fleet simulator (``gtm sim``, ``gtm bench routing``): see README.md."""
