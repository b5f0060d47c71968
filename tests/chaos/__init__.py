"""A fault campaign, in the manner of Jepsen: workloads on a three-node Apache Kafka under a
seeded nemesis (broker kills and pauses, worker kills and pauses), every operation recorded in
a JSON-lines history, and a checker per delivery promise. Run it with ``./dev chaos``."""
