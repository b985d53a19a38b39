"""The receipt stream to SIEMs: receipts as CloudEvents, pushed to a webhook with a persisted cursor."""
