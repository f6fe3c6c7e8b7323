"""A deployment-wide embedding store: encoders look an image's embeddings up by mm_hash before
encoding it and publish what they encode (``base.EmbeddingStore``; ``mooncake.MooncakeStore`` on
Mooncake Store, ``base.NoStore`` for none). No grpc here."""
