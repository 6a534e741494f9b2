"""The pure core: detectors over records in event time. No Kafka, Redis or wall clock here."""
