"""The users' paths suite (issue 22): real ``gtm up --processes`` on loopback, driven from the
client's side — through DNS answers, straight to a region, with forged headers and stale
answers — the way real clients reach gtm rather than the way tier unit tests do."""
