"""The scheduler node: membership, slot ownership, the timer loop, firing and history writing."""
