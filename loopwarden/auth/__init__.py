"""Who is calling over HTTP: bearer tokens (static, minted by operators) and OAuth access tokens from an issuer."""
