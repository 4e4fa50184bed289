"""The debugging tools that check a program's use of the device while it runs:
the stream sanitizer (stream.py) and the device memory checker (memcheck.py);
docs/sanitizers.md. Neither loads until asked for: importing torchneuron
loads one only when its environment variable turns it on."""
