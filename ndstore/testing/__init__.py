"""What the package ships for testing: contract suites for its ports, written once and run on
every implementation (subclass a suite and give it the fixture it names), and in-memory fakes
where one makes engine tests fast."""
