"""What the user holds: meshes, hosts, endpoint references and their adverbs."""
