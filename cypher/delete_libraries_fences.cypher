MATCH (f:LibraryFence) WHERE f.uid IN $fences
DETACH DELETE f
